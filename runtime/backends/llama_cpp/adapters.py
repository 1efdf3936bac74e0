"""The LoRA adapters of one llama_cpp replica (runtime.backends.shared.adapters declares them).

Each adapter is loaded once over the replica's weights (``llama_adapter_lora_init``) and stays
until the weights go or a reconfigure drops it (``LoraSet.sync``: adapters added or dropped
without reloading the weights).  A context applies one set of adapters to a whole
``llama_decode``, so the batch loop decodes the sequences of one adapter per step, as
llama-server does: ``turn`` says whose step it is (the adapters of the active generations in
turn, the base among them as ""), ``members`` which sequences go, and ``apply`` puts that
adapter on the context before the decode (``llama_set_adapters_lora``, which llama.cpp skips
when nothing changed).

A sequence's KV cache was computed with the adapter of the generation that ran on it
(``held``): a generation with another adapter reuses none of it (``visible``, ``take``), and
the saved KV caches (runtime.backends.llama_cpp.kv_store) hold the base's sequences only.

Everything here runs on the replica's worker thread, the one caller of its native objects.
"""
from __future__ import annotations

import ctypes

from runtime.backends.llama_cpp.native import EngineLoadError, native
from runtime.backends.shared.adapters import adapter_paths, declared, require_loaded
from runtime.errors import BackendError, InvalidLoadRequest

BASE = ""  # the turn of the generations without an adapter
# What a sequence holds once the adapter that filled it is dropped or replaced: a name no adapter
# has (adapter names have no ":"), so no generation reuses it and the KV store does not save it.
DROPPED = ":dropped"


class LoraSet:
    """The adapters loaded over one replica's weights and what its context's sequences hold."""

    def __init__(self):
        self._loaded: dict[str, tuple[object, str]] = {}  # name -> (handle, path)
        self._scales: dict[str, float] = {}
        self._applied: tuple[int, str] | None = None  # (id of the context, adapter) set last
        self._held: dict[int, str] = {}  # sequence -> the adapter its cache was computed with
        self._last_turn = BASE

    @property
    def names(self) -> list[str]:
        return list(self._loaded)

    def sync(self, weights, config: dict, base_dir: str) -> None:
        """Load the adapters ``config`` declares that are not loaded yet over ``weights``, free
        those it no longer declares, and take its scales.  EngineLoadError names a file llama.cpp cannot read; the
        adapters loaded before stay as they were then."""
        wanted = adapter_paths(config, base_dir)
        added: dict[str, tuple[object, str]] = {}
        lib = native()
        for name, path in wanted.items():
            if name in self._loaded and self._loaded[name][1] == path:
                continue
            handle = lib.llama_adapter_lora_init(weights.model, path.encode("utf-8"))
            if not handle:
                for loaded, _ in added.values():
                    lib.llama_adapter_lora_free(loaded)
                raise EngineLoadError(f"llama.cpp could not load the LoRA adapter {name!r} from {path}")
            added[name] = (handle, path)
        for name in [n for n in self._loaded if n not in wanted or n in added]:
            lib.llama_adapter_lora_free(self._loaded.pop(name)[0])
            self._held = {seq: DROPPED if held == name else held for seq, held in self._held.items()}
        self._loaded.update(added)
        self._loaded = {name: self._loaded[name] for name in wanted}
        self._scales = {name: adapter["scale"] for name, adapter in declared(config).items()}
        self._applied = None

    def resync(self, weights, config: dict, base_dir: str) -> None:
        """``sync`` for a reconfigure: a file llama.cpp cannot read is 400 invalid_load_request."""
        try:
            self.sync(weights, config, base_dir)
        except EngineLoadError as exc:
            raise InvalidLoadRequest(str(exc), param="adapters_loaded") from None

    def close(self) -> None:
        """Free every adapter (before the weights)."""
        lib = native()
        for handle, _ in self._loaded.values():
            lib.llama_adapter_lora_free(handle)
        self._loaded.clear()
        self._applied = None

    # -- the batch loop's hooks (runtime.backends.llama_cpp.batching) -------------------------
    def turn(self, adapters: list[str | None]) -> str | None:
        """The adapter this step decodes for, among ``adapters`` (the active generations'): the
        next after the last turn's, in name order, so no adapter waits more than one step per other."""
        wanted = sorted({adapter or BASE for adapter in adapters})
        later = [adapter for adapter in wanted if adapter > self._last_turn]
        self._last_turn = later[0] if later else wanted[0]
        return self._last_turn or None

    def held(self, seq: int) -> str | None:
        """The adapter sequence ``seq``'s cache was computed with (None: the base; ``DROPPED``: one
        no longer loaded as it was)."""
        return self._held.get(seq) or None

    def visible(self, context, adapter: str | None) -> list[list[int]]:
        """The context's sequences as ``adapter`` may reuse them: another adapter's are empty."""
        return [tokens if self.held(seq) == adapter else [] for seq, tokens in enumerate(context.sequences)]

    def take(self, context, seq: int, adapter: str | None) -> None:
        """Sequence ``seq`` goes to a generation with ``adapter``: emptied if another one filled it.
        AdapterNotLoaded (409) for an adapter the ``adapters_loaded`` override left out."""
        require_loaded(adapter, self._loaded)
        if self.held(seq) != adapter:
            context.clear(seq)
        if adapter is None:
            self._held.pop(seq, None)
        else:
            self._held[seq] = adapter

    def forget(self) -> None:
        """The context is new (reconfigure, wake): its sequences hold nothing yet."""
        self._held.clear()
        self._applied = None

    def apply(self, context, adapter: str | None) -> None:
        """Put ``adapter`` (None: none) on ``context`` for its next decode."""
        if self._applied == (id(context), adapter or BASE):
            return
        lib = native()
        if adapter is None:
            lib.llama_set_adapters_lora(context.ctx, None, 0, None)
        else:
            handle = self._loaded[adapter][0]
            handles = (lib.llama_adapter_lora_p_ctypes * 1)(handle)
            scales = (ctypes.c_float * 1)(self._scales[adapter])
            if lib.llama_set_adapters_lora(context.ctx, handles, 1, scales) != 0:
                raise BackendError(f"llama.cpp refused the LoRA adapter {adapter!r}")
        self._applied = (id(context), adapter or BASE)
