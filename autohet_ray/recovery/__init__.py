"""The pure half of recovery and of the controller (no Ray, no actor calls): the controller's states, what
recovery decides and the state it keeps, the recovery budget, failures printed as they happen and the exit
codes, what a stopping job says about its newest step, the spot notice board's state, and which dropped
keepers may be stopped. elastic/ and orchestrate/ carry these out on Ray."""
