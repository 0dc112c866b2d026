"""BERT, ALBERT, T5 and decoder-only LM builders, presets, T5 generation,
the recall encoder.

The names below load their module on first use (PEP 562), so importing
`thattn.models.config` or `thattn.models.presets` (plain Python) imports
no TensorFlow: the Keras 3 models (`thattn.keras3.models`) build from the
same configs on JAX and PyTorch.
"""

import importlib

from thattn.core import requirements

# Public name -> the module (in this package) that defines it.
_EXPORTS = {
    "FeedForward": "blocks", "PostNormBlock": "blocks",
    "PreNormBlock": "blocks", "RMSNorm": "blocks",
    "apply_overrides": "config", "ATTENTION_TYPES": "config",
    "AttentionConfig": "config", "BertConfig": "config",
    "T5Config": "config", "DecoderConfig": "config",
    "PaddingMask": "embeddings", "Pooler": "embeddings",
    "PositionEmbedding": "embeddings", "StackPositionBias": "embeddings",
    "TokenEmbedding": "embeddings",
    "build_model": "factory", "create_model": "factory",
    "model_config": "presets",
    "generate": "generation", "T5Generator": "generation",
    "DecoderLMGenerator": "generation",
    "load": "loading",
    "PRESETS": "presets", "preset_names": "presets",
    "RecallEncoder": "recall_encoder",
}


_SUBMODULES = ("bert", "blocks", "config", "embeddings", "factory", "heads",
               "generation", "hugging_face_decoders", "hugging_face_encoders",
               "loading", "presets", "recall_encoder", "t5")
# The submodules that are plain Python; the others build tf_keras models.
_PLAIN = ("config", "presets", "hugging_face_decoders",
          "hugging_face_encoders")


def _submodule(name):
  if name not in _PLAIN:
    requirements.require(f"{__name__}.{name}", ("tensorflow", "tf_keras"))
  return importlib.import_module(f"{__name__}.{name}")


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(_submodule(_EXPORTS[name]), name)
  if name in _SUBMODULES:
    return _submodule(name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_EXPORTS) + list(_SUBMODULES))
