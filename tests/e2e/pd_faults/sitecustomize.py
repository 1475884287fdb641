"""Test-only fault injection for the P/D e2e tests, loaded by the decode server's interpreters through
``PYTHONPATH`` when ``PD_FAULTS_DIR`` is set. A flag file in that folder arms one fault for the next read:

- ``corrupt``: after the next successful read, the first transferred range is overwritten with garbage;
- ``fail``: the next read raises as a failed Mooncake transfer would.

Each flag is consumed by the read it affects.
"""

import ctypes
import os

_DIR = os.environ.get("PD_FAULTS_DIR")

if _DIR:
    from vllm_ascend.kvtransfer import engine as _engine

    _read = _engine.MooncakeEngine.read

    def _take(name: str) -> bool:
        try:
            os.remove(os.path.join(_DIR, name))
        except FileNotFoundError:
            return False
        return True

    def read(self, peer, transfer):
        if _take("fail"):
            raise _engine.TransferError(f"injected failure of a read from {peer}")
        _read(self, peer, transfer)
        if transfer.lengths and _take("corrupt"):
            ctypes.memset(transfer.local[0], 0x7F, min(transfer.lengths[0], 4096))

    _engine.MooncakeEngine.read = read
