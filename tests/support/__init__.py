"""What the tests and the benchmarks share: the scripted OpenAI-compatible model server
(llm_server.py) and real `manage.py qcluster`/daphne processes to run against
(processes.py). Test support, not part of any production app."""
