"""BERT, ALBERT and T5 builders, presets, T5 generation, the recall encoder."""

from thattn.models.blocks import FeedForward
from thattn.models.blocks import PostNormBlock
from thattn.models.blocks import PreNormBlock
from thattn.models.blocks import RMSNorm
from thattn.models.config import apply_overrides
from thattn.models.config import ATTENTION_TYPES
from thattn.models.config import AttentionConfig
from thattn.models.config import BertConfig
from thattn.models.config import T5Config
from thattn.models.embeddings import PaddingMask
from thattn.models.embeddings import Pooler
from thattn.models.embeddings import PositionEmbedding
from thattn.models.embeddings import StackPositionBias
from thattn.models.embeddings import TokenEmbedding
from thattn.models.factory import build_model
from thattn.models.factory import create_model
from thattn.models.factory import model_config
from thattn.models.generation import generate
from thattn.models.generation import T5Generator
from thattn.models.loading import load
from thattn.models.presets import PRESETS
from thattn.models.presets import preset_names
from thattn.models.recall_encoder import RecallEncoder
