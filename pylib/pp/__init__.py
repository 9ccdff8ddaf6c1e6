"""Pipeline parallelism: stages, schedules as data, a pure simulator, and the executor that runs them."""
