"""BERT, ALBERT, T5 and decoder-only LMs as Keras 3 models (TensorFlow, JAX,
PyTorch).

The model front end of `thattn.keras3`: the builders of `thattn.models`
(the same `BertConfig` / `T5Config` / `DecoderConfig`, presets and
overrides) written with
`keras.ops` and thattn.keras3's layers, with the tf_keras models' weights
(names, shapes and order), so `set_weights(get_weights())` moves a model
between the two front ends. docs/architecture.md says how they divide the
work. Importing this on JAX or PyTorch imports no TensorFlow.
"""

from thattn.keras3.models.bert import build_bert
from thattn.keras3.models.blocks import FeedForward
from thattn.keras3.models.blocks import PostNormBlock
from thattn.keras3.models.blocks import PreNormBlock
from thattn.keras3.models.blocks import RMSNorm
from thattn.keras3.models.embeddings import Pooler
from thattn.keras3.models.embeddings import PositionEmbedding
from thattn.keras3.models.embeddings import StackPositionBias
from thattn.keras3.models.embeddings import TokenEmbedding
from thattn.keras3.models.factory import build_model
from thattn.keras3.models.factory import create_model
from thattn.keras3.models.generation import DecoderLMGenerator
from thattn.keras3.models.generation import generate
from thattn.keras3.models.generation import T5Generator
from thattn.keras3.models.heads import ClassificationHead
from thattn.keras3.models.heads import MaskedLMHead
from thattn.keras3.models.heads import SpanHead
from thattn.keras3.models.loading import load
from thattn.keras3.models.recall_encoder import RecallEncoder
from thattn.keras3.models.t5 import build_t5
