#!/usr/bin/env bash
# Regenerate planner/ingest/proto/tf_subset_pb2.py from tf_subset.proto.
#
#   scripts/gen_proto.sh           rewrite the checked-in tf_subset_pb2.py
#   scripts/gen_proto.sh --check   exit 1 if the checked-in file is stale
#
# Pinned: grpcio-tools==1.65.5, whose bundled protoc is 26.1 (gencode
# "Protobuf Python Version: 5.26.1"). Do not bump it casually:
#   * protoc >= 27 writes a runtime_version.ValidateProtobufRuntimeVersion()
#     call into the module. That call raises on any runtime older than the
#     protoc (e.g. 28.1 gencode on protobuf 5.28.0) and warns on the next major
#     (5.x gencode on protobuf 6.30/6.31), and users with TensorFlow installed
#     may have any protobuf from 5.28 (TF 2.18-2.20) to 7.x.
#   * protoc 26.1 gencode has no such check and sets `_loaded_options`, the
#     attribute name current runtimes use. It was verified to import under
#     `python -W error` (upb and pure-python backends) with protobuf 4.21.12,
#     4.23.4, 4.25.9, 5.26.1, 5.27.5, 5.28.0, 5.29.6, 6.30.0, 6.31.1, 6.33.6,
#     7.34.0 and 7.36.2.
# The output depends only on the protoc version and on the proto path relative
# to the repo root (-I .), so reruns give a byte-identical file.
#
# The tool venv lives outside the repo ($PROTOC_VENV, default under $TMPDIR)
# and is reused. grpcio-tools 1.65.5 has wheels for CPython 3.8-3.12 only; set
# $PYTHON to pick the interpreter (default: the first of python3.12, 3.11,
# 3.10, 3.9, python3 on PATH that runs and is 3.9-3.12).
set -euo pipefail

GRPCIO_TOOLS_VERSION=1.65.5
PROTOC_VERSION="libprotoc 26.1"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
proto_rel="planner/ingest/proto/tf_subset.proto"
out_rel="planner/ingest/proto/tf_subset_pb2.py"

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

venv="${PROTOC_VENV:-${TMPDIR:-/tmp}/planner-protoc-venv-grpcio-tools-${GRPCIO_TOOLS_VERSION}}"

if [[ ! -x "$venv/bin/python" ]] || \
   ! "$venv/bin/python" -m grpc_tools.protoc --version 2>/dev/null | grep -qx "$PROTOC_VERSION"; then
  py="${PYTHON:-}"
  if [[ -z "$py" ]]; then
    for cand in python3.12 python3.11 python3.10 python3.9 python3; do
      # Run it: a pyenv shim exists even when its version is not selected.
      if "$cand" -c 'import sys; sys.exit(not (3, 9) <= sys.version_info[:2] <= (3, 12))' \
          >/dev/null 2>&1; then
        py="$cand"
        break
      fi
    done
  fi
  if [[ -z "$py" ]]; then
    echo "gen_proto.sh: need CPython 3.9-3.12 (grpcio-tools ${GRPCIO_TOOLS_VERSION} wheels); set PYTHON" >&2
    exit 1
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --only-binary=:all: "grpcio-tools==${GRPCIO_TOOLS_VERSION}"
fi

got="$("$venv/bin/python" -m grpc_tools.protoc --version)"
if [[ "$got" != "$PROTOC_VERSION" ]]; then
  echo "gen_proto.sh: expected '$PROTOC_VERSION', $venv has '$got'" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

(cd "$repo_root" && "$venv/bin/python" -m grpc_tools.protoc -I . --python_out="$tmp" "$proto_rel")

if [[ "$check" == 1 ]]; then
  if cmp -s "$tmp/$out_rel" "$repo_root/$out_rel"; then
    echo "$out_rel is up to date"
  else
    echo "$out_rel is stale: run scripts/gen_proto.sh" >&2
    exit 1
  fi
else
  cp "$tmp/$out_rel" "$repo_root/$out_rel"
  echo "wrote $out_rel ($got)"
fi
