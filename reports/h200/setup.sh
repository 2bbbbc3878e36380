# Sourced by the step scripts on the lent GPU machine: the carried wheels (simpy), unbuffered output,
# and every result under $R packed into $OUT/results.tgz when the script ends (the tool brings back
# at most 8 files).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/results; rm -rf $R; mkdir -p $R
trap 'tar czf $OUT/results.tgz -C $R .' EXIT
