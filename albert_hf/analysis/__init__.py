"""The paper's analyses: layer transitions (Figure 1), intrinsic accuracies (Table 5), parameter counts (Tables 1-4).
They read trained models and the jobs' data building; no job imports them (what a job reports beside its results
is in `albert_hf.reports`).

    python -m albert_hf.analysis.transitions --model DIR [--model DIR ...] --texts FILE --out fig.png
    python -m albert_hf.analysis.intrinsic --model DIR --documents FILE_OR_DIR [...]
    python -m albert_hf.analysis.params
"""
