"""Per generator type: which packets are its own and the metrics that apply to it. The trial
analysis dispatches on the type recorded in trial.json (one module per type, each with an
``Analysis`` that takes what it needs of each capture, then finishes)."""

from analysis.traffic import bulk_tcp, cbr_udp, transaction, web_poisson

ANALYSES = {
    "bulk_tcp": bulk_tcp.Analysis,
    "cbr_udp": cbr_udp.Analysis,
    "web_poisson": web_poisson.Analysis,
    "transaction": transaction.Analysis,
}
