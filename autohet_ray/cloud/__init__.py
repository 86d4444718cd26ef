"""Cloud instance-metadata services: spot/preemption notice readers and a local fake of AWS IMDSv2."""
