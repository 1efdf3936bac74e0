"""The whisper backend: ``spec`` (definition and rules) and ``engine`` (faster-whisper, CTranslate2's
Whisper, in an engine process)."""
