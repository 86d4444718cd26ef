"""Training-step figures (loss, speed, MFU, peak memory) and where they are written (TensorBoard)."""
