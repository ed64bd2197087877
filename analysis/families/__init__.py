"""One report module per experiment family: a trial's headline figures (trial_summary) and the
paper's tables over a batch (print_tables, trial_table). The `experiment:` key picks it."""

from analysis.families import collateral_damage, diffserv, eft, startup

FAMILIES = {
    "collateral_damage": collateral_damage,
    "diffserv": diffserv,
    "eft": eft,
    "startup": startup,
}
