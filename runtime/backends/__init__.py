"""The backend registry: one module per backend, one ``BackendSpec`` each."""
from __future__ import annotations

from runtime.backends.base import BackendSpec
from runtime.backends.ct2 import Ct2Spec
from runtime.backends.exllamav3 import Exllamav3Spec
from runtime.backends.llama_cpp import LlamaCppSpec
from runtime.backends.llama_server import LlamaServerSpec
from runtime.backends.openai_remote import OpenaiRemoteSpec
from runtime.backends.sglang_serve import SglangServeSpec
from runtime.backends.stub import StubSpec
from runtime.backends.trtllm_serve import TrtllmServeSpec
from runtime.backends.vllm import VllmSpec
from runtime.backends.vllm_serve import VllmServeSpec

BACKENDS: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        LlamaCppSpec(),
        LlamaServerSpec(),
        Exllamav3Spec(),
        VllmSpec(),
        VllmServeSpec(),
        TrtllmServeSpec(),
        SglangServeSpec(),
        Ct2Spec(),
        OpenaiRemoteSpec(),
        StubSpec(),
    )
}
