"""The training job as plain data: its config (`config.TrainJob`), each setting and its default stated once."""
