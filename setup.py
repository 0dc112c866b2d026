"""Packaging for thattn: talking-heads attention and its relatives for tf-keras."""

import setuptools

# One pin per dependency; every other version follows from these.
INSTALL_REQUIRES = [
    "tensorflow==2.21.*",
    "tf-keras==2.21.*",
    "tensorflow-text==2.21.*",
    "mesh-tensorflow==0.1.21",
    "absl-py",
    "numpy",
    # Trains SentencePiece models; tensorflow-text runs them in the graph.
    "sentencepiece",
]

EXTRAS_REQUIRE = {
    # matplotlib: tests draw thattn-ablate's plots.
    "test": ["pytest", "pytest-xdist", "matplotlib"],
    # tf-models-official==2.20.0 pins tensorflow~=2.20, which would pull a
    # second TensorFlow. It is installed separately with --no-deps; see
    # benchmarks/README.md. These are the packages it then still needs.
    "bench": ["gin-config", "scipy"],
    # TFDS sources (c4, lm1b, wikipedia, glue, squad); tested with mock data.
    "tfds": ["tensorflow-datasets"],
    # The Mesh TensorFlow backend (thattn.mtf): mesh_tensorflow.transformer
    # imports gin, tensorflow_datasets and pkg_resources (gone in
    # setuptools 81). thattn.mtf.compat says why each is needed.
    "mtf": ["gin-config", "tensorflow-datasets", "setuptools<81"],
    # Viewing thattn-train's summaries (writing them needs only TensorFlow).
    "tensorboard": ["tensorboard"],
    # thattn-ablate's plots and heatmaps.
    "plot": ["matplotlib"],
    # Keras 3 backends for thattn.keras3 (keras itself comes with
    # TensorFlow). torch 2.13: on CPU machines pip's local CPU-only wheel
    # (2.13.0+cpu) satisfies it, and sorts above the CUDA build on PyPI.
    "jax": ["jax[cpu]"],
    "torch": ["torch==2.13.*"],
}

setuptools.setup(
    name="thattn",
    version="0.1.0",
    description="Talking-heads attention and its relatives as tf-keras layers.",
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
        ],
    },
)
