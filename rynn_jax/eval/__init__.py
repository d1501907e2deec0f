"""Evaluation of generated videos against ground truth (`python eval.py`): metrics, LPIPS, FVD,
baselines, the evaluation loop and its report. One module per job."""
