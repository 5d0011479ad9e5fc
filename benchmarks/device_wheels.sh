#!/usr/bin/env bash
# Wheels of the Python packages bert_jax needs that a GPU machine's image may lack (its image has
# jax, flax, optax, orbax, absl, sentencepiece, numpy, protobuf, etils...; not ml_collections,
# grain, tensorflow-datasets, cramjam, google-crc32c, zstandard, tensorboardX and their small
# dependencies: seen missing on an H200 image, 2026-12-04), for CPython 3.12 on x86-64 Linux,
# into runs/device_wheels (ignored by git), where benchmarks/device_check.sh installs them from:
#   bash benchmarks/device_wheels.sh [EXTRA_SPEC...]   # e.g. protobuf==7.36.2 (see below)
# The versions are requirements.txt's and what they resolved to here. promise has no wheel on
# PyPI: it is built here (pure Python). If the device check stops at its import check with a
# protobuf "gencode" version error, add the protobuf wheel: `bash benchmarks/device_wheels.sh
# protobuf==7.36.2`. PYTHON_VERSION (default 3.12) is the machine's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version="${PYTHON_VERSION:-3.12}"
out=runs/device_wheels
pip="${PIP:-.venv/bin/pip}"
mkdir -p "$out"
binary=(ml_collections==1.1.0 grain==0.2.18 array_record==0.8.6 dm-tree==0.1.10
        tensorflow-datasets==4.9.10 immutabledict==4.3.1 simple-parsing==0.1.9
        docstring_parser==0.18.0 tensorflow-metadata==1.21.0 googleapis-common-protos==1.76.0
        termcolor==3.3.0 toml==0.10.2 portpicker==1.6.0 cramjam==2.14.0 google-crc32c==1.9.0
        zstandard==0.25.0 tensorboardX==2.6.5 "$@")
platforms=()
for tag in manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 \
           manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
           manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 \
           any; do
  platforms+=(--platform "$tag")
done
"$pip" download -q --no-deps --only-binary=:all: --python-version "$python_version" \
  --implementation cp "${platforms[@]}" -d "$out" "${binary[@]}"
"$pip" wheel -q --no-deps -w "$out" promise==2.3
ls -l "$out"
du -sh "$out"
