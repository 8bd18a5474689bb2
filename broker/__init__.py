"""The shuffling bridge between devices and the aggregator."""
