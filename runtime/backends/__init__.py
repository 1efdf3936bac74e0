"""The backend registry: one folder per backend (its ``spec`` beside its engine), one
``BackendSpec`` each; what several backends share lives in ``shared/``."""
from __future__ import annotations

from runtime.backends.base import BackendSpec
from runtime.backends.ct2.spec import Ct2Spec
from runtime.backends.exllamav3.spec import Exllamav3Spec
from runtime.backends.llama_cpp.spec import LlamaCppSpec
from runtime.backends.llama_server.spec import LlamaServerSpec
from runtime.backends.openai_remote.spec import OpenaiRemoteSpec
from runtime.backends.sglang_serve.spec import SglangServeSpec
from runtime.backends.stub.spec import StubSpec
from runtime.backends.trtllm_serve.spec import TrtllmServeSpec
from runtime.backends.vllm.spec import VllmSpec
from runtime.backends.vllm_serve.spec import VllmServeSpec
from runtime.backends.whisper.spec import WhisperSpec

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
        WhisperSpec(),
        OpenaiRemoteSpec(),
        StubSpec(),
    )
}
