"""Schemathesis hooks of `make api-conformance` (scripts/api-conformance.sh).

The OpenAPI document says a deploy carries a module as a string; it cannot say
the string must be a valid WebAssembly module. A generated string never is, so
without help every deploy would answer 400 and the stateful phase could never
reach the `{id}` routes. This hook swaps a generated module *string* for a
real module (keeping every other field, valid or not): schema-invalid bodies
stay invalid, and schema-valid ones can deploy. Nothing else is changed.
"""

import base64

import schemathesis
from schemathesis.transport.serialization import Binary

# A module for either style: an export-call module with a parameterless `init`
# (so snapshots can be captured) and an `add` export, and a `_start` that
# makes it a WASI command too.
MODULE_WAT = """(module
  (memory (export "memory") 1)
  (func (export "_start"))
  (global $ready (mut i32) (i32.const 0))
  (func (export "init") (global.set $ready (i32.const 1)))
  (func (export "add") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.add))
"""


def _is_deploy(context) -> bool:
    operation = context.operation
    return operation is not None and operation.method.upper() == "POST" and operation.path == "/functions"


@schemathesis.hook
def map_body(context, body):
    if not _is_deploy(context):
        return body
    if isinstance(body, dict):
        if isinstance(body.get("wat"), str):
            body = {**body, "wat": MODULE_WAT}
        if isinstance(body.get("module_base64"), str):
            body = {**body, "module_base64": base64.b64encode(MODULE_WAT.encode()).decode()}
        return body
    if isinstance(body, Binary):
        # application/wasm: binary or WAT text.
        return Binary(MODULE_WAT.encode())
    if isinstance(body, (bytes, str)):
        return MODULE_WAT.encode()
    return body
