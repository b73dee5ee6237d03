"""The Janus application-integration experiment (§V-D, Fig. 13) on `sluicegate local`.

``python -m loadtest.experiment.run`` (``make experiment``) runs it; see loadtest/README.md.
"""
