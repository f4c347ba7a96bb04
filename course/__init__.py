"""The course's own tooling, never imported by a lesson.

The course's own tooling, never imported by a lesson: the runner (make run, refresh, gpu-check), the site, the
Chinese edition's catalogs, and what the tests check a session left alone. ARCHITECTURE.md says what goes where."""
