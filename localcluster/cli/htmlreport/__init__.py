"""The HTML report of ``python -m localcluster.report``: `data` (the
records of ``metrics.jsonl`` -> what the page shows), `page` (its
sections) and `svg` (the charts)."""
