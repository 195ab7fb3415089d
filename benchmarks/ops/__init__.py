"""Each op (and the ops-heavy modules) against its peers on one GPU, as users call it."""
