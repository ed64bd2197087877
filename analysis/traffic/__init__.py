"""Per generator type: which packets are its own and the metrics that apply to it. The trial
analysis dispatches on the type recorded in trial.json (one module per type)."""

from analysis.traffic import bulk_tcp, cbr_udp, transaction, web_poisson

ANALYSES = {
    "bulk_tcp": bulk_tcp.analyse,
    "cbr_udp": cbr_udp.analyse,
    "web_poisson": web_poisson.analyse,
    "transaction": transaction.analyse,
}
