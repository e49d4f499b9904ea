"""Trainers: offline REINFORCE on per-step weights (``offline``; trajectory DPO in ``dpo``), the
pointwise reward model (``reward_model``), the online actor (``online``) and ArCHer's critic
(``archer``), on one engine (``engine``, ``checkpoint``); their typed settings in ``settings``."""
