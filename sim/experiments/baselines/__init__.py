"""The paper's baselines for key-value / sparse ternary vector aggregation under eps-LDP."""
