"""Developer tools (not part of the kvlab package): the Gluon emulator that CPU tests run kernels
through, and the offline sm_90 compiler that prints registers, spills and SASS without a GPU."""
