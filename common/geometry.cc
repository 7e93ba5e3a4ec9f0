// Implemented with its header; see geometry.h.
