"""Offline reproduction of the paper's experiments (``coco experiment``): accuracy of Collision,
CoCo and the baselines, the amplification comparison and the empirical tightness audit."""
