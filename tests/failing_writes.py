"""Runs a script with every write whose path contains PATTERN failing as a full disk fails it: part of the file is
written, then OSError(ENOSPC). `python tests/failing_writes.py PATTERN SCRIPT [ARGS...]` (tests/test_storage.py).
The writers patched are those checkpoints and model folders go through: torch.save, safetensors' save_file (also
as transformers' and accelerate's own names for it) and accelerate's checkpoint `save`."""

import errno
import runpy
import sys

pattern, script, *arguments = sys.argv[1:]


def failing(write):
    def write_or_fail(obj, target, *args, **kwargs):
        if pattern in str(target):
            with open(target, "wb") as partial:
                partial.write(b"\0" * 4096)  # the disk fills partway through the file
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        return write(obj, target, *args, **kwargs)

    return write_or_fail


import accelerate.checkpointing  # noqa: E402
import accelerate.utils.other  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers.modeling_utils  # noqa: E402

torch.save = failing(torch.save)
safetensors.torch.save_file = failing(safetensors.torch.save_file)
transformers.modeling_utils.safe_save_file = failing(transformers.modeling_utils.safe_save_file)
accelerate.utils.other.safe_save_file = failing(accelerate.utils.other.safe_save_file)
accelerate.checkpointing.save = failing(accelerate.checkpointing.save)
sys.argv = [script, *arguments]
runpy.run_path(script, run_name="__main__")
