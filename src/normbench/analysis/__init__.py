"""A sweep's runs read back and their statistics: loading (find the run directories, read them, group
them by their settings), stats (values, intervals, time to target), contrasts (the verdict box's effects
with the seed as the unit, Holm's adjustment), numbers (rounding to the spread), unstarted (the jobs of
a sweep not started). `report` and `claims` build on it."""
