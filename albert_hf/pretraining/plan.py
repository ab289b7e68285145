"""The run's plan on the hardware in hand, before it spends anything: `--dry_run` (`dry_run`: the plan, nothing
written) and `--auto_find_batch_size` (`auto_micro_batch`: the micro-batch every process can run).

The numbers come from real training steps of the run's model (its config, micro-batch, sequence length, masked
positions, precision and optimizer) on the device, on synthetic batches of the run's shape, not from a formula:
- the peak memory of a step: on a GPU `torch.cuda.max_memory_allocated`; on a CPU the process's anonymous memory
  (Pss_Anon of /proc/self/smaps_rollup, what the benchmarks measure), sampled while the steps run, so it holds the
  interpreter and the libraries too, as the run's process will;
- of it, what does not depend on the batch: the weights, their gradients and the optimizer's two moments;
- the same peak with activation checkpointing (recomputing activations in backward);
- tokens per second of one micro-batch's forward, backward and update, and the time to --max_train_steps at that
  rate, accumulation and number of processes (assumed to scale linearly).
What a run adds beside the step (reading and tokenizing the corpus, the data loader's workers) is not in it.
"""

import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from accelerate.utils import DistributedType

from ..configuration_albert_hf import AlbertHFConfig
from ..errors import InputError, first_line
from ..hub.loading import loading
from ..modeling_albert_hf import AlbertHFForPreTraining
from ..runtime.cli import is_first_process
from .arguments import PretrainingArguments
from .data import prepared_data
from .resolution import hardware_and_precision
from .training.model import count_parameters, make_optimizer

SAMPLE_SECONDS = 0.005  # how often the CPU's anonymous memory is read during the measured steps


def anonymous_bytes() -> int:
    """This process's Pss_Anon: its own memory, not the libraries' file pages it shares."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss_Anon:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/self/smaps_rollup has no Pss_Anon")


class PeakSampler:
    """The highest Pss_Anon seen while the `with` block runs, read every SAMPLE_SECONDS by a thread."""

    def __enter__(self):
        self.peak, self.done = anonymous_bytes(), threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self):
        while not self.done.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, anonymous_bytes())

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, anonymous_bytes())


@dataclass(frozen=True)
class StepMeasure:
    """What `measure_steps` saw."""

    peak_bytes: int  # the process's peak during the steps (CPU: Pss_Anon; GPU: allocated by torch)
    static_bytes: int  # weights, gradients and optimizer state, whatever the batch
    micro_batch_seconds: float  # one micro-batch's forward, backward and update: the median of the timed ones


def synthetic_batch(vocab_size: int, batch: int, seq: int, masked: int, device, generator) -> dict:
    """A batch of the run's shape: two segments, `masked` masked positions a row, a sentence-order label."""
    input_ids = torch.randint(5, vocab_size, (batch, seq), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2 :] = 1
    labels = torch.full_like(input_ids, -100)
    for row in range(batch):
        positions = torch.randperm(seq - 2, generator=generator)[:masked] + 1
        labels[row, positions] = input_ids[row, positions]
    found = dict(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=torch.ones_like(input_ids),
        labels=labels,
        sentence_order_label=torch.randint(0, 2, (batch,), generator=generator),
    )
    return {key: value.to(device) for key, value in found.items()}


def measure_steps(
    config: AlbertHFConfig,
    micro_batch: int,
    seq: int,
    masked: int,
    optimization,
    device,
    autocast_dtype: torch.dtype | None,
    checkpointing: bool,
    steps: int = 4,
) -> StepMeasure:
    """`steps` training steps of the run's model at its micro-batch (the first one builds the optimizer state and
    is not timed), measured as the module docstring says. `optimization`: the run's OptimizationArgs."""
    torch.manual_seed(0)
    model = AlbertHFForPreTraining(config).to(device).train()
    if checkpointing:
        model.activation_checkpointing_enable()
    optimizer = make_optimizer(model, optimization)
    batch = synthetic_batch(config.vocab_size, micro_batch, seq, masked, device, torch.Generator().manual_seed(0))
    cuda = torch.device(device).type == "cuda"

    def step():
        with torch.autocast(torch.device(device).type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optimization.max_grad_norm or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    with PeakSampler() as sampler:
        for _ in range(steps):
            began = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - began)
    peak = torch.cuda.max_memory_allocated(device) if cuda else sampler.peak
    tensors = [
        *model.parameters(),
        *(value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)),
    ]
    static = sum(t.numel() * t.element_size() for t in tensors) + sum(
        p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
    )  # the gradients
    return StepMeasure(peak, static, statistics.median(seconds[1:]) if steps > 1 else seconds[0])


def batch_split(global_batch: int, processes: int, micro: int, accumulation: int) -> str:
    """The start line's and the plan's account of the global batch, e.g. `global batch 4096 = 16 processes x 32 x 8
    accumulation`."""
    if processes == 1 and accumulation == 1:
        return f"global batch {global_batch}"
    return (
        f"global batch {global_batch} = {processes} process{'es' * (processes > 1)} x {micro} x {accumulation} "
        "accumulation"
    )


def gib(count: float) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def available_bytes(device) -> tuple[int, str]:
    """What the step may use: the GPU's free memory, or the machine's MemAvailable (and what it was read from)."""
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, "free on the GPU"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024, "MemAvailable"
    raise OSError("/proc/meminfo has no MemAvailable")


def plan_lines(
    config: AlbertHFConfig,
    *,
    micro_batch: int,
    accumulation: int,
    processes: int,
    seq: int,
    masked: int,
    max_train_steps: int,
    optimization,
    device,
    autocast_dtype,
    checkpointing: bool,
    where: str,
) -> tuple[list[str], dict]:
    """The plan as printed lines, and the same numbers as a dict (for scripts and tests)."""
    parameters = count_parameters(config)
    measured = measure_steps(config, micro_batch, seq, masked, optimization, device, autocast_dtype, checkpointing)
    other = measure_steps(config, micro_batch, seq, masked, optimization, device, autocast_dtype, not checkpointing)
    available, source = available_bytes(device)
    tokens_per_second = micro_batch * seq / measured.micro_batch_seconds
    total_seconds = max_train_steps * accumulation * measured.micro_batch_seconds
    numbers = {
        "parameters": parameters,
        "peak_bytes": measured.peak_bytes,
        "static_bytes": measured.static_bytes,
        "peak_bytes_other_checkpointing": other.peak_bytes,
        "available_bytes": available,
        "fits": measured.peak_bytes <= available,
        "tokens_per_second": tokens_per_second,
        "projected_seconds": total_seconds,
    }
    flip = "without" if checkpointing else "with"
    lines = [
        f"Plan of this run on {where} (from real training steps on synthetic batches; nothing written):",
        f"  model: {parameters:,} parameters, vocabulary {config.vocab_size:,}",
        f"  {batch_split(micro_batch * accumulation * processes, processes, micro_batch, accumulation)}, {seq} "
        "tokens each",
        f"  peak memory of a training step: {gib(measured.peak_bytes)}, of which weights, gradients and the "
        f"optimizer's moments {gib(measured.static_bytes)}; {flip} activation checkpointing: "
        f"{gib(other.peak_bytes)}",
        f"  fits: {'yes' if numbers['fits'] else 'NO'}, {gib(measured.peak_bytes)} of {gib(available)} ({source})"
        + (
            ""
            if numbers["fits"]
            else "; try a smaller --per_device_train_batch_size"
            + (" or --gradient_checkpointing" if not checkpointing and other.peak_bytes < measured.peak_bytes else "")
        ),
        f"  speed: {tokens_per_second:,.0f} tokens/s a process (a micro-batch's forward, backward and update)",
        f"  time to --max_train_steps {max_train_steps:,}: {duration(total_seconds)} ({accumulation} micro-batch"
        f"{'es' * (accumulation > 1)} a step{'; the processes assumed to scale linearly' if processes > 1 else ''})",
    ]
    return lines, numbers


def find_micro_batch(
    config: AlbertHFConfig,
    largest: int,
    per_process: int,
    seq: int,
    masked: int,
    optimization,
    device,
    autocast_dtype,
    checkpointing: bool,
) -> tuple[int, list[str]]:
    """--auto_find_batch_size: the largest micro-batch of at most `largest` that divides `per_process` (the global
    batch's share of a process, so that the accumulation keeps the global batch) and whose training step runs here.

    The candidates are tried from the largest down, each with two real steps, halving after one that runs out of
    memory (the device's out-of-memory error). On a CPU, where running out ends the process, a candidate is tried
    only when its peak predicted from the smallest one's measured step fits in 90% of MemAvailable: the process's
    memory before the step, plus the step's batch-independent part, plus the smallest one's activations per example
    times the candidate. Returns the micro-batch and what did not fit, for the start line."""
    candidates = [size for size in range(max(largest, 1), 0, -1) if per_process % size == 0]
    refused, cuda = [], torch.device(device).type == "cuda"
    if not cuda:
        before = anonymous_bytes()
        small = measure_steps(
            config, candidates[-1], seq, masked, optimization, device, autocast_dtype, checkpointing, steps=2
        )
        per_example = max(small.peak_bytes - before - small.static_bytes, 0) / candidates[-1]
        limit = 0.9 * available_bytes(device)[0]
        fitting = [size for size in candidates if before + small.static_bytes + per_example * size <= limit]
        refused += [f"{size} (predicted over 90% of MemAvailable)" for size in candidates if size not in fitting]
        candidates = fitting or candidates[-1:]
    while candidates:
        size = candidates[0]
        try:
            measure_steps(config, size, seq, masked, optimization, device, autocast_dtype, checkpointing, steps=2)
            return size, refused
        except torch.OutOfMemoryError:
            refused.append(f"{size} (out of memory)")
            if cuda:
                torch.cuda.empty_cache()
            candidates = [smaller for smaller in candidates if smaller <= size // 2]
    raise InputError(
        "--auto_find_batch_size: no micro-batch down to 1 runs a training step on this device (out of "
        "memory): try --gradient_checkpointing or a smaller --max_seq_length"
    )


def planned_config(args: PretrainingArguments) -> AlbertHFConfig:
    """The config of the model the run will train, before its tokenizer is built: the vocabulary of
    --model_name_or_path, --tokenizer_name or --prepared_data, or --vocab_size for one still to be trained."""
    vocab = args.config.vocab_size
    if not args.model.model_name_or_path:
        if args.data.tokenizer_name:
            with loading("--tokenizer_name", args.data.tokenizer_name):
                vocab = len(transformers.AutoTokenizer.from_pretrained(args.data.tokenizer_name))
        elif args.data.prepared_data:
            vocab = prepared_data.read_manifest(args.data.prepared_data)["tokenizer_size"]
        else:
            vocab = args.data.vocab_size
    return AlbertHFConfig(**{**args.config.to_diff_dict(), "vocab_size": vocab})


def auto_micro_batch(args: PretrainingArguments, accelerator, precision) -> tuple[int, int, list[str]]:
    """--auto_find_batch_size: (the micro-batch every process can run (`find_micro_batch`, the smallest process's
    answer), the accumulation that keeps the global batch, the start line's note)."""
    optimization = args.optimization
    if accelerator.is_fsdp2 or accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise InputError(
            "--auto_find_batch_size measures the unsharded model's step, not an FSDP or DeepSpeed "
            "shard's: pass --auto_find_batch_size false (after a recipe file) and a "
            "--per_device_train_batch_size"
        )
    processes = accelerator.num_processes
    total = optimization.global_batch_size or (
        optimization.per_device_train_batch_size * optimization.gradient_accumulation_steps * processes
    )
    size, refused = find_micro_batch(
        planned_config(args),
        optimization.per_device_train_batch_size,
        total // processes,
        args.data.max_seq_length,
        args.objective.max_predictions_per_seq,
        optimization,
        accelerator.device,
        precision.autocast_dtype,
        args.model.gradient_checkpointing,
    )
    size = int(accelerator.gather(torch.tensor([size], device=accelerator.device)).min())
    accumulation = total // (processes * size)
    note = f"--auto_find_batch_size: micro-batch {size} x {accumulation} accumulation" + (
        f" ({', '.join(refused)} did not fit)" if refused else ""
    )
    return size, accumulation, [note]


def dry_run(args: PretrainingArguments) -> dict:
    """--dry_run: the plan of this run's model, micro-batch, precision and processes on this process's
    device; printed by the first process. Returns its numbers."""
    optimization = args.optimization
    hardware, precision = hardware_and_precision(optimization)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if hardware.device == "cuda" else "cpu"
    try:
        config, unknown = planned_config(args), None
    except InputError as error:  # a tokenizer out of reach here (offline): the plan goes on with the config's
        config, unknown = args.config, first_line(error)
    lines, numbers = plan_lines(
        config,
        micro_batch=optimization.per_device_train_batch_size,
        accumulation=optimization.gradient_accumulation_steps,
        processes=args.processes,
        seq=args.data.max_seq_length,
        masked=args.objective.max_predictions_per_seq,
        max_train_steps=optimization.max_train_steps,
        optimization=optimization,
        device=device,
        autocast_dtype=precision.autocast_dtype,
        checkpointing=args.model.gradient_checkpointing,
        where=f"{hardware.describe()}; {precision.describe()}",
    )
    if unknown:
        lines.insert(
            2, f"  vocabulary: the config's ({config.vocab_size:,}); the tokenizer's is unknown here: {unknown}"
        )
    schedule = args.schedule
    lines += [f"  {schedule.describe()}", f"    0 {schedule.sketch()} {schedule.max_train_steps:,} steps"]
    if args.sources is not None and is_first_process():
        lines += mix_plan(args)
    if is_first_process():
        print("\n".join(lines), flush=True)
    return numbers


def mix_plan(args: PretrainingArguments) -> list[str]:
    """--dry_run of a mixed run: per source its weight, size, the pairs drawn over the run and its epochs. The
    sizes need the pairs: they are built here (cached `datasets` maps, which the run then reads) or read from
    prepared folders."""
    from .data.inputs import build_mixed_data
    from .data.mixture import MixPlan, held_out_lines, plan_lines

    data, optimization = args.data, args.optimization
    if data.prepared_data:
        mix = prepared_data.load(data.prepared_data, args.sources).mix  # memory-mapped: no pairs read
    else:
        mix = build_mixed_data(
            data, args.sources, args.objective.task, optimization.seed, args.model.model_name_or_path
        ).mix
    batch = optimization.per_device_train_batch_size * optimization.gradient_accumulation_steps * args.processes
    streamed = any(size is None for size in mix.sizes.values())
    if streamed:  # each process draws its own micro-batches on the schedule
        batch //= args.processes
    plan = MixPlan.start(mix.names, mix.sizes, mix.weights, batch)
    where = " per process" if streamed and args.processes > 1 else ""
    return [
        f"  sources ({len(mix.names)}, weights {mix.weighting}; over {optimization.max_train_steps:,} steps of "
        f"{batch:,} pairs{where}):"
    ] + [f"    {line}" for line in plan_lines(plan, optimization.max_train_steps * batch) + held_out_lines(mix)]
