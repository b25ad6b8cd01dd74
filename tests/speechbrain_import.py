"""Importing SpeechBrain in the tests where torchaudio does not import.

SpeechBrain 1.1.2 imports torchaudio when it is imported (``speechbrain/__init__`` -> ``core`` ->
``dataio.dataio`` -> ``utils.torch_audio_backend``, which reads ``torchaudio.__version__`` to log a hint);
nothing on ``Brain.fit``'s or the ``Checkpointer``'s path calls it. torchaudio's wheels are built for one
torch version each (and those in the registry for CUDA), so next to another torch it fails to load. There,
:func:`import_speechbrain` gives SpeechBrain an empty ``torchaudio`` module (no version: SpeechBrain logs that
it cannot check it) and says so; everything the tests run is SpeechBrain's own code.
"""

from __future__ import annotations

import sys
import types
import warnings


def import_speechbrain() -> bool:
    """Import ``speechbrain`` (core and checkpoints); whether torchaudio had to be stood in for. Raises
    ImportError where SpeechBrain itself is not installed."""
    import importlib.util

    if importlib.util.find_spec("speechbrain") is None:
        raise ImportError("speechbrain is not installed")
    stood_in = False
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: its C++ extension does not load against this torch
        for name in [name for name in sys.modules if name == "torchaudio" or name.startswith("torchaudio.")]:
            del sys.modules[name]
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")
        warnings.warn(
            f"torchaudio does not import ({type(exc).__name__}); SpeechBrain gets an empty stand-in",
            stacklevel=2,
        )
        stood_in = True
    import speechbrain.core
    import speechbrain.utils.checkpoints  # noqa: F401

    return stood_in
