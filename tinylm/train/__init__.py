"""Training: the LightningModule, LR schedules, callbacks, the health monitor and the loggers."""
