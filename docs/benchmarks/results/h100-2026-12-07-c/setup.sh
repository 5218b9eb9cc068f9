# sourced by call1.sh and call2.sh: main's wheels (.whl/old, carried) in /tmp/rlk-old; the same with
# the tree's rlk_cuda/*.py in /tmp/rlk-tree; TRL 1.16 and its wheels (.whl/trl) in /tmp/trl-site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/rlk-old .whl/old/*.whl  # main's
rm -rf /tmp/rlk-tree; cp -r /tmp/rlk-old /tmp/rlk-tree; cp packages/rlk-cuda/src/rlk_cuda/*.py /tmp/rlk-tree/rlk_cuda/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/trl-site .whl/trl/*.whl
export PYTHONUNBUFFERED=1 EXTRA=/tmp/trl-site:$PWD/tests/plugins/rlk-testbackend/src
main() { PYTHONPATH=/tmp/rlk-old:$EXTRA "$@"; }
tree() { PYTHONPATH=/tmp/rlk-tree:$EXTRA "$@"; }
