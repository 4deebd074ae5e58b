"""Daemon layer: where a budget change is handled: the budget control (decide, plan, reload or replace, acknowledge),
its planning in the background, the records of a change under way, the placement planner and the memory readings
(VRAM, host memory) it plans against."""
