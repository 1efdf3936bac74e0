import pytest

from runtime.inputs.chat_templates import TemplateRenderError, UnsafeTemplate, render_chat_template

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_renders_a_chatml_template():
    text = render_chat_template(CHATML, [{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_the_sandbox_refuses_python_internals(template):
    with pytest.raises(UnsafeTemplate):
        render_chat_template(template, [{"role": "user", "content": "x"}])


def test_immutable_sandbox_refuses_mutation():
    with pytest.raises(UnsafeTemplate):
        render_chat_template("{% set _ = messages.append(1) %}", [])


def test_raise_exception_and_syntax_errors_are_render_errors():
    with pytest.raises(TemplateRenderError, match="only user"):
        render_chat_template("{{ raise_exception('only user roles') }}", [])
    with pytest.raises(TemplateRenderError):
        render_chat_template("{% for %}", [])
