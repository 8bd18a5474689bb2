"""``coco demo``: the whole pipeline on one machine, devices -> shuffler -> aggregator."""
