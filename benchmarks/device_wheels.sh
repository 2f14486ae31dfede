#!/bin/bash
# Fetch, here, the wheels that a lent GPU machine lacks, for its Python 3.12 (it reaches no package index): coop's
# runtime dependencies that its image does not hold, at the versions this project's own environment runs. They go to
# .whl/ (ignored by git), about 49 MB, which a device call names in `carry`; benchmarks/device_acceptance.sh installs
# them there. Run from the repository root: `sh benchmarks/device_wheels.sh`.
set -eu
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    ortools==9.15.6755 immutabledict==4.3.1 protobuf==6.33.6 \
    pulp==3.3.2 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
    sortedcontainers==2.4.0
ls .whl
