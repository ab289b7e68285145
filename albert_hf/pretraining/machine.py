"""What a pretraining run decides from the machine it runs on (`MachinePlan`), beside its arguments, which stay as
parsed: the hardware and the precision in force, the step (--torch_compile_mode auto resolved for the device,
`resolution.choose_step`), and the micro-batch and accumulation (--auto_find_batch_size's, `plan.auto_micro_batch`,
else the arguments'). `run.setup` makes it; the start line says it, and the loop, the checkpoints' cards and the
final folder read it."""

from dataclasses import dataclass

from ..runtime.hardware import Hardware, Precision


@dataclass(frozen=True)
class MachinePlan:
    hardware: Hardware
    precision: Precision
    compile: bool  # the blocks compiled (--torch_compile, or the step --torch_compile_mode auto chose)
    compile_mode: str | None  # torch.compile's mode (None: its default), or the whole step as one CUDA graph
    micro_batch: int  # pairs a process takes at once
    accumulation: int  # micro-batches an optimizer step

    def global_batch(self, processes: int) -> int:
        return self.micro_batch * self.accumulation * processes
