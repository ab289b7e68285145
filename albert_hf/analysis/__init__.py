"""The paper's analyses: layer transitions (Figure 1), intrinsic accuracies (Table 5), parameter counts (Tables 1-4).
They read trained models and the jobs' data building; no job imports them (what a job reports beside its results
is in `albert_hf.reports`).

    python -m albert_hf.analysis.transitions --model DIR [--model DIR ...] --texts FILE --out fig.png
    python -m albert_hf.analysis.intrinsic --model DIR --documents FILE_OR_DIR [...]
    python -m albert_hf.analysis.params
"""

import importlib

# Lazy: `python -m albert_hf.analysis.transitions` must not find its own module already imported by the package.
_EXPORTS = {
    "layer_transitions": "transitions",
    "transition_sums": "transitions",
    "model_transitions": "transitions",
    "build_intrinsic_sets": "intrinsic",
    "evaluate_intrinsic": "intrinsic",
    "sop_by_document": "intrinsic",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_EXPORTS)
