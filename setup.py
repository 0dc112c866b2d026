"""Packaging for thattn: talking-heads attention and its relatives.

Installed by need (thattn/core/requirements.py says what needs which extra),
from a checkout (thattn is not on a package index):

    pip install -e '.[jax]'         # Keras 3 layers and models on JAX
    pip install -e '.[torch]'       # ... on PyTorch
    pip install -e '.[tensorflow]'  # tf_keras layers, thattn-train, export
    pip install -e '.[mtf]'         # and the Mesh TensorFlow backend
"""

import pathlib
import re

import setuptools

ROOT = pathlib.Path(__file__).parent
# One place for the version: thattn/__init__.py.
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    (ROOT / "thattn" / "__init__.py").read_text(),
                    flags=re.M).group(1)

# What every install needs; no framework. etils (pure Python): epy's
# lazy_imports, through which a task module imports TensorFlow only where
# it uses it (thattn.core.requirements.lazy_imports), and epath, through
# which a model_dir is read and written with or without TensorFlow
# (thattn.io.run_dir, checkpoint_reading).
INSTALL_REQUIRES = ["absl-py", "numpy", "etils[epath,epy]"]

# Keras 3: the layers follow keras.layers.MultiHeadAttention of 3.15.
# safetensors: a keras3 run's checkpoints on TensorFlow and PyTorch
# (thattn.io.safetensors_checkpoints), and Hugging Face checkpoints
# (thattn-convert --source).
KERAS = ["keras>=3.15,<4", "safetensors"]

# One pin per framework; every other version follows from these.
TENSORFLOW = KERAS + [
    "tensorflow==2.21.*",
    "tf-keras==2.21.*",
    "tensorflow-text==2.21.*",
    # Trains SentencePiece models; tensorflow-text runs them in the graph.
    "sentencepiece",
    # Hugging Face folders' byte-level BPE tokenizers (tokenizer.json) for
    # thattn-convert, the source's own library (tested with 0.23).
    "tokenizers>=0.22,<1",
]

EXTRAS_REQUIRE = {
    # Keras 3 on JAX or PyTorch, without TensorFlow. jax[cpu]: tested with
    # 0.10 on CPU and 0.11 on a GPU; on a GPU add JAX's CUDA wheels
    # (jax[cuda13]). torch 2.13: on CPU machines pip's local CPU-only wheel
    # (2.13.0+cpu) satisfies it, and sorts above the CUDA build on PyPI.
    # orbax-checkpoint: a keras3 run's checkpoints on JAX
    # (thattn.io.orbax_checkpoints); tested with 0.12.
    "jax": KERAS + ["jax[cpu]>=0.10,<0.12", "orbax-checkpoint==0.12.*"],
    "torch": KERAS + ["torch==2.13.*"],
    # The tf_keras layers and models, thattn-train, thattn-export, the data
    # pipeline, thattn-convert's BERT and ALBERT sources, and thattn.keras3
    # on TensorFlow.
    "tensorflow": TENSORFLOW,
    # The Mesh TensorFlow backend (thattn.mtf, thattn-convert to and from
    # Mesh TensorFlow):
    # mesh_tensorflow.transformer imports gin, tensorflow_datasets and
    # pkg_resources (gone in setuptools 81). thattn.mtf.compat says why each
    # is needed.
    "mtf": TENSORFLOW + ["mesh-tensorflow==0.1.21", "gin-config",
                         "tensorflow-datasets", "setuptools<81"],
    # TFDS sources (c4, lm1b, wikipedia, glue, squad); tested with mock data.
    "tfds": TENSORFLOW + ["tensorflow-datasets"],
    # Viewing thattn-train's summaries (writing them needs only TensorFlow).
    "tensorboard": ["tensorboard"],
    # thattn-ablate's plots and heatmaps.
    "plot": ["matplotlib"],
    # The API reference (docs/api): Sphinx autodoc.
    "docs": ["sphinx>=8.1,<10"],
    # matplotlib: tests draw thattn-ablate's plots. transformers: the
    # reference the Hugging Face conversion is held to (on CPU PyTorch).
    # transformers is pinned: 5.25 tokenizes ALBERT's SentencePiece model
    # otherwise than 5.24 on one sample text (measured 2026-12-03), which
    # tests/converters/hugging_face_test.py holds thattn's ids to.
    "test": ["pytest", "pytest-xdist", "matplotlib", "transformers==5.24.*"],
    # tf-models-official==2.20.0 pins tensorflow~=2.20, which would pull a
    # second TensorFlow. It is installed separately with --no-deps; see
    # benchmarks/README.md. These are the packages it then still needs.
    "bench": ["gin-config", "scipy"],
}

setuptools.setup(
    name="thattn",
    version=VERSION,
    description=("Talking-heads attention and its relatives as Keras 3 and "
                 "tf_keras layers, in BERT, ALBERT and T5."),
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=setuptools.find_packages(include=["thattn", "thattn.*"]),
    # Kernel sources, compiled against the installed TensorFlow on first use.
    package_data={"thattn.kernels": ["*.cc"]},
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={
        "console_scripts": [
            "thattn-train=thattn.bin.train:run",
            "thattn-export=thattn.bin.export:run",
            "thattn-ablate=thattn.bin.ablate:run",
            "thattn-complexity=thattn.bin.complexity:run",
            "thattn-convert=thattn.bin.convert:run",
            "thattn-generate=thattn.bin.generate:run",
        ],
    },
)
