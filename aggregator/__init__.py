"""The aggregator: streaming estimators, the shuffle privacy accountant, and (later) the
service that consumes shuffled batches and exports metrics."""
