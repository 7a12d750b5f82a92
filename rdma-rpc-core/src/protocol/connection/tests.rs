//! Unit tests of one side's state, with frames written by hand.
