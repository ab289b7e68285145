"""The one place that knows the machine a run is on, and the precision it trains in there.

`detect()` records what decides speed: the CPU model, torch's CPU capability and whether the CPU has bf16 matmul
units (AMX, AVX-512 BF16, Arm's BF16), the threads, and the CUDA device with its compute capability and bf16
support. `choose_precision` turns that and the user's request into the run's mixed-precision mode:

    request                       CPU with bf16 units   CPU without            CUDA, bf16 (Ampere+)   older CUDA
    auto (no flag, no config)     bf16 autocast         fp32                   bf16                   fp16 + scaling
    --mixed_precision / config    as asked; bf16 where the hardware has no bf16 units warns in one line

Without bf16 units, torch emulates bf16 arithmetic: on a 2-core AVX2 CPU a bf16 matmul ran 59x slower than fp32
(BENCHMARKS.md, "Per kind of CPU"), so auto trains in fp32 there. On CUDA devices of compute capability
8.0 or more, fp32 matmuls use TF32 unless --tf32 false.

The decision reads only flags torch and the system expose (no timing), so it is instant, and it is tested under
every answer with a made-up `Hardware`.
"""

import math
import os
import platform
import re
from dataclasses import dataclass

import torch

from ..errors import InputError

# The ONEDNN_MAX_CPU_ISA values (oneDNN's names) below which oneDNN does not use the CPU's bf16 instructions:
# a user (or a test that stands in for an older CPU) who caps the ISA gets the speed of the capped CPU.
_ISA_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


@dataclass(frozen=True)
class Hardware:
    cpu_model: str
    cpu_capability: str  # torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, SVE256, DEFAULT, ...
    cpu_bf16_units: str | None  # "AMX", "AVX512_BF16", "Arm BF16", or None: bf16 is emulated
    threads: int  # torch's intra-op threads in this process
    cpu_fp16_units: bool = False  # AMX-FP16 (Granite Rapids); elsewhere fp16 on a CPU is emulated
    gpu_name: str | None = None  # the CUDA device this process trains on
    gpu_capability: tuple[int, int] | None = None
    gpu_bf16: bool = False
    gpu_count: int = 0

    @property
    def device(self) -> str:
        return "cuda" if self.gpu_name else "cpu"

    @property
    def cpu_kind(self) -> str:
        """The CPU's speed class: its bf16 units when it has them, torch's capability otherwise."""
        return self.cpu_bf16_units or self.cpu_capability

    @property
    def tf32(self) -> bool:
        """TF32 tensor cores: CUDA compute capability 8.0 (Ampere) or more."""
        return self.gpu_capability is not None and self.gpu_capability >= (8, 0)

    @property
    def fast_precisions(self) -> tuple[str, ...]:
        """The precisions with hardware units here, fastest first."""
        if self.device == "cuda":
            major = self.gpu_capability[0] if self.gpu_capability else 0
            return ("bf16",) * self.gpu_bf16 + ("fp16",) * (major >= 7) + ("tf32",) * self.tf32 + ("fp32",)
        return ("bf16",) * bool(self.cpu_bf16_units) + ("fp32",)

    def describe(self) -> str:
        """E.g. 'cpu: AMD EPYC 7B13, AVX2, 2 threads' or 'cuda: NVIDIA H100 80GB HBM3, compute capability 9.0'."""
        if self.device == "cuda":
            major, minor = self.gpu_capability or (0, 0)
            return f"cuda: {self.gpu_name}, compute capability {major}.{minor}"
        return f"cpu: {self.cpu_model}, {self.cpu_kind}, {self.threads} thread{'s' * (self.threads != 1)}"


def _cpuinfo_value(*keys: str) -> str | None:
    """The value of the first /proc/cpuinfo line whose key starts with one of `keys` (None off Linux)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith(keys):
                    return line.split(":", 1)[1]
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's marketing name ('model name' in /proc/cpuinfo on Linux), else what the platform reports."""
    name = _cpuinfo_value("model name", "cpu model")
    if name is not None:  # "Intel(R) Xeon(R) CPU" -> "Intel Xeon CPU"
        return " ".join(re.sub(r"\((R|TM|tm|r)\)", "", name).split())
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (x86 'flags', Arm 'Features'); empty off Linux."""
    return set((_cpuinfo_value("flags", "features") or "").split())


def _onednn_isa_allows_bf16(environ=os.environ) -> bool:
    cap = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return cap not in _ISA_WITHOUT_BF16


def cpu_bf16_units(environ=os.environ) -> str | None:
    """Which bf16 matmul units this CPU has and oneDNN may use (torch's bf16 matmuls run there), or None."""
    if not _onednn_isa_allows_bf16(environ):
        return None
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        if torch.cpu._is_amx_tile_supported():
            return "AMX"
        if torch.cpu._is_avx512_bf16_supported():
            return "AVX512_BF16"
        return None
    if platform.machine().lower() in ("aarch64", "arm64") and "bf16" in cpu_flags():
        return "Arm BF16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None
    return None


def detect() -> Hardware:
    """This process's hardware, as torch sees it (a launched process sees its own GPU).

    Returns:
        A `Hardware`: the CPU's model, torch's CPU capability, its bf16 matmul units (None where bf16 is emulated,
        or oneDNN's ISA is capped below them), AMX-FP16, torch's intra-op threads; with CUDA, the current device's
        name, compute capability and bf16 support, and the number of devices.
    """
    gpu = {}
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        gpu = dict(
            gpu_name=torch.cuda.get_device_name(index),
            gpu_capability=torch.cuda.get_device_capability(index),
            gpu_bf16=torch.cuda.is_bf16_supported(including_emulation=False),
            gpu_count=torch.cuda.device_count(),
        )
    return Hardware(
        cpu_model=cpu_model(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_bf16_units=cpu_bf16_units(),
        threads=torch.get_num_threads(),
        cpu_fp16_units=torch.cpu._is_amx_fp16_supported() and _onednn_isa_allows_bf16(),
        **gpu,
    )


# ----------------------------------------------------------------------------------------------------------------
# The precision a run trains in

MIXED_PRECISION_CHOICES = ("auto", "no", "bf16", "fp16")
PRECISION_NAMES = {"no": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast with loss scaling"}  # accelerate's


@dataclass(frozen=True)
class Precision:
    mixed_precision: str  # accelerate's value: "no", "bf16" or "fp16"
    reason: str  # why, for the start line
    warning: str | None = None  # one line when an explicit request will be slow here
    tf32: bool = False  # fp32 matmuls on TF32 tensor cores

    @property
    def autocast_dtype(self) -> "torch.dtype | None":
        """The dtype autocast computes in, or None for fp32."""
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mixed_precision)

    def describe(self) -> str:
        """E.g. 'fp32: this CPU has no bf16 units (AVX2)'."""
        return f"{PRECISION_NAMES[self.mixed_precision]}{' (TF32 matmuls)' * self.tf32}: {self.reason}"


def choose_precision(
    hardware: Hardware, flag: str | None = "auto", launcher: str | None = None, tf32: bool | None = None
) -> Precision:
    """The run's precision from `flag` (--mixed_precision: auto, no, bf16, fp16), `launcher` (the mixed_precision
    `accelerate launch` passes on from its config or flags, ACCELERATE_MIXED_PRECISION) and `tf32` (--tf32; None:
    on wherever the GPU has it).

    An explicit flag wins; then the launcher's bf16 or fp16. The launcher's "no" is what `accelerate launch` passes
    when nothing was asked (and the default answer of `accelerate config`), so it is read as no preference and the
    hardware decides; `--mixed_precision no` is the way to insist on fp32.

    Args:
        hardware (`Hardware`): the machine, from `detect()`.
        flag (`str`, *optional*, defaults to `"auto"`): --mixed_precision; `"auto"` or None leaves the choice to
            the launcher and the hardware.
        launcher (`str`, *optional*): `accelerate launch`'s mixed_precision (`"no"`, `"bf16"`, `"fp16"`, `"fp8"`).
        tf32 (`bool`, *optional*): --tf32; None or True: on wherever the GPU has TF32, False: off.

    Returns:
        A `Precision`: accelerate's mixed_precision (`"no"`, `"bf16"` or `"fp16"`), the reason for the start line,
        a one-line warning when an explicit request (flag or launcher) runs slowly here, and whether fp32 matmuls
        use TF32.

    Raises:
        InputError: a request for fp8, which albert_hf does not run.
    """
    if flag not in (None, "auto"):
        requested, source = flag, f"--mixed_precision {flag}"
    elif launcher in ("bf16", "fp16", "fp8"):
        requested, source = launcher, f"the accelerate config's mixed_precision {launcher}"
    else:
        requested = source = None
    if requested == "fp8":
        raise InputError(
            "the accelerate config asks for mixed_precision fp8, which albert_hf does not run (it "
            "needs fp8 GPU units and an fp8 library); use bf16, fp16 or no"
        )
    tf32_on = hardware.tf32 and tf32 is not False
    if requested is None:
        mode, reason = _auto(hardware)
        if launcher == "no" and mode != "no":
            reason += (
                " (the launcher's mixed_precision 'no', accelerate's default, is read as no preference; "
                "--mixed_precision no insists on fp32)"
            )
        return Precision(mode, reason, tf32=tf32_on)
    return Precision(
        requested, f"asked for by {source}", _slow_request_warning(hardware, requested, source), tf32=tf32_on
    )


def _auto(hardware: Hardware) -> tuple[str, str]:
    if hardware.device == "cuda":
        if hardware.gpu_bf16:
            return "bf16", f"the {hardware.gpu_name} has bf16 units"
        major, minor = hardware.gpu_capability or (0, 0)
        return "fp16", f"the {hardware.gpu_name} (compute capability {major}.{minor}) has no bf16 units"
    if hardware.cpu_bf16_units:
        return "bf16", f"this CPU has {hardware.cpu_bf16_units} bf16 units"
    return "no", f"this CPU has no bf16 units ({hardware.cpu_capability})"


def _slow_request_warning(hardware: Hardware, requested: str, source: str, trainer: bool = False) -> str | None:
    """One line for a request that runs slowly here, naming the flag that avoids it: an accelerate config's request
    wins over auto, so that one needs an explicit flag; the fine-tuning scripts have transformers' flags."""
    from_config = source.startswith("the accelerate config")
    if requested == "bf16" and hardware.device == "cpu" and not hardware.cpu_bf16_units:
        fix = (
            "without --bf16 it trains in fp32"
            if trainer
            else "--mixed_precision no trains in fp32"
            if from_config
            else "--mixed_precision auto (or no) trains in fp32"
        )
        return (
            f"{source} on a CPU without bf16 units ({hardware.cpu_capability}): torch emulates bf16 there, "
            "matmuls run tens of times slower than fp32 (59x on a 2-core AVX2 EPYC), so expect a run many "
            f"times slower; {fix}"
        )
    if requested == "bf16" and hardware.device == "cuda" and not hardware.gpu_bf16:
        fix = (
            "--fp16 avoids it"
            if trainer
            else "--mixed_precision fp16 avoids it"
            if from_config
            else "--mixed_precision auto (fp16 with loss scaling) avoids it"
        )
        return (
            f"{source} on the {hardware.gpu_name}, which has no bf16 units: torch emulates bf16 there, "
            f"much slower than fp16; {fix}"
        )
    if requested == "fp16" and hardware.device == "cpu" and not hardware.cpu_fp16_units:
        fix = "--mixed_precision no trains in fp32" if from_config else "--mixed_precision auto picks the fast one"
        return (
            f"{source} on a CPU without fp16 matmul units: slower than fp32 (useful for parity with GPU runs "
            f"only); {fix}"
        )
    return None


def bf16_trainer_warning(hardware: Hardware) -> str | None:
    """The fine-tuning scripts' one line for --bf16 where the hardware has no bf16 units (None where it has)."""
    return _slow_request_warning(hardware, "bf16", "--bf16", trainer=True)


def use_tf32(precision: Precision):
    """Lets fp32 matmuls run on TF32 tensor cores when `precision` says so (before the model runs); otherwise
    torch's default (IEEE fp32) is left as it is."""
    if precision.tf32:
        torch.set_float32_matmul_precision("high")


# ----------------------------------------------------------------------------------------------------------------
# The peak a run's MFU is measured against

# Dense (no sparsity) TFLOP/s from the vendors' data sheets, matched against the CUDA device's name in this order:
# (words of the name, the name said, 16-bit tensor cores, TF32 tensor cores, plain fp32). T4 and V100 have no bf16
# (their 16-bit figure is fp16's) and no TF32 (that column repeats fp32's).
GPU_PEAK_TFLOPS = [
    (("H200", "NVL"), "H200 NVL", 835.0, 417.5, 60.0),
    (("H200",), "H200 SXM", 989.0, 494.5, 67.0),
    (("H100", "PCIe"), "H100 PCIe", 756.0, 378.0, 51.0),
    (("H100", "NVL"), "H100 NVL", 835.0, 417.5, 60.0),
    (("H100",), "H100 SXM", 989.0, 494.5, 67.0),
    (("A100",), "A100", 312.0, 156.0, 19.5),
    (("L40S",), "L40S", 362.0, 183.0, 91.6),
    (("L40",), "L40", 181.0, 90.5, 90.5),
    (("L4",), "L4", 121.0, 60.0, 30.3),
    (("T4",), "T4", 65.0, 8.1, 8.1),
    (("V100", "PCIe"), "V100 PCIe", 112.0, 14.0, 14.0),
    (("V100",), "V100 SXM", 125.0, 15.7, 15.7),
]


@dataclass(frozen=True)
class Peak:
    """The per-device TFLOP/s that MFU divides by, and where it comes from."""

    tflops: float
    source: str  # e.g. "H100 SXM, bf16 dense", or "--peak_tflops"

    def describe(self) -> str:
        """E.g. '989 TFLOP/s (H100 SXM, bf16 dense)'."""
        return f"{self.tflops:g} TFLOP/s ({self.source})"


def gpu_peak(gpu_name: str, mixed_precision: str, tf32: bool = False) -> Peak | None:
    """The GPU's dense spec peak for the precision its matmuls run in (bf16/fp16 autocast: the 16-bit tensor cores;
    fp32: TF32's when `tf32`, plain fp32's otherwise); None for a GPU off the table."""
    row = next((row for row in GPU_PEAK_TFLOPS if all(word.lower() in gpu_name.lower() for word in row[0])), None)
    if row is None:
        return None
    _, name, half, tf32_peak, fp32 = row
    if mixed_precision in ("bf16", "fp16"):
        return Peak(half, f"{name}, {mixed_precision} dense")
    return Peak(tf32_peak, f"{name}, TF32 dense") if tf32 else Peak(fp32, f"{name}, fp32")


def check_peak_tflops(value: float | None) -> None:
    """--peak_tflops, where a script takes it: a positive, finite TFLOP/s (or None: the table decides)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InputError(f"--peak_tflops {value:g}: a device's peak must be a number above 0")


def mfu_peak(hardware: Hardware, precision: Precision, peak_tflops: float | None = None) -> tuple[Peak | None, str]:
    """The peak this run's MFU is measured against, and the start line's note that names it (or says why there is
    none): --peak_tflops wins; else a GPU's dense spec peak for the run's precision; a CPU has none."""
    if peak_tflops is not None:
        peak = Peak(peak_tflops, "--peak_tflops")
    elif hardware.device == "cuda":
        peak = gpu_peak(hardware.gpu_name, precision.mixed_precision, precision.tf32)
        if peak is None:
            return None, (
                f"no MFU: the {hardware.gpu_name} is not in albert_hf's table of GPU peaks (--peak_tflops sets one)"
            )
    else:
        return None, "no MFU: a CPU has no peak in albert_hf's table (--peak_tflops sets one)"
    return peak, f"MFU against {peak.describe()}"


# torch's names of its SDPA kernels (torch.nn.attention.SDPBackend), as a start line says them
SDPA_KERNELS = {
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "memory-efficient",
    "CUDNN_ATTENTION": "cuDNN",
    "MATH": "math (unfused)",
    "OVERRIDEABLE": "device-specific",
}


def attention_kernel(config, device: torch.device, dtype: torch.dtype, seq_len: int, training: bool = True) -> str:
    """The attention a model of `config` runs on `device` at `seq_len` tokens, for a start line: SDPA's kernel as
    torch itself picks it (`torch._fused_sdp_choice`, on a probe of the run's head size, dtype, dropout and a
    padding mask), or the stand-ins albert_hf uses instead."""
    from torch.nn.attention import SDPBackend

    from ..modeling_albert_hf import MATMUL_ATTENTION_MAX_LENGTH, use_matmul_attention

    implementation = config._attn_implementation
    if implementation != "sdpa":
        return f"attention: {implementation}"
    heads, head_size = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    probe = torch.zeros(1, heads, seq_len, head_size, device=device, dtype=dtype)
    if use_matmul_attention(config, probe, training):
        return (
            "attention: matmul + softmax (SDPA's stand-in when training on a CPU at up to "
            f"{MATMUL_ATTENTION_MAX_LENGTH} tokens)"
        )
    mask = torch.ones(1, 1, 1, seq_len, device=device, dtype=torch.bool)
    dropout = config.attention_probs_dropout_prob if training else 0.0
    chosen = SDPBackend(torch._fused_sdp_choice(probe, probe, probe, mask, dropout, False)).name
    return f"attention: SDPA's {SDPA_KERNELS.get(chosen, chosen)} kernel"


def enable_cpu_fp16(accelerator):
    """accelerate silently trains in fp32 when asked for fp16 on a CPU; torch has CPU fp16 autocast and loss
    scaling, so turn them on (slow: CPUs have no fp16 matmul units; use bf16 for speed, fp16 for parity with GPU
    runs). This sets two attributes of the Accelerator before `prepare`; tests/test_pretraining.py checks it."""
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu")
