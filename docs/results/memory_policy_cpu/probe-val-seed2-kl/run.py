"""Validation-only probe (never the held-out questions): seed 2's GRPO stage 1 of the CPU recipe,
from the same SFT adapter, with a KL term to the starting adapter and half the learning rate."""
import json
import sys

from memsearch.train.config import GRPOConfig
from memsearch.train.grpo import train_grpo

cfg = json.load(open("runs/mp-cpu/seed-2/grpo1/config.json"))
cfg["kl_coef"] = 0.05
cfg["optim"]["lr"] = 5e-5
cfg["eval"]["at_start"] = True
train_grpo(GRPOConfig.model_validate(cfg), "runs/probe-v2/grpo1-kl05-lr5e-5", resume="--resume" in sys.argv)
