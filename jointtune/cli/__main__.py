"""`python -m jointtune.cli ...` (what `torchrun -m jointtune.cli worker ...` runs on every rank)."""

from jointtune.cli import main

main()
