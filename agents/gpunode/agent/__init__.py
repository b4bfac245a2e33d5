"""The agent skeleton: what every gpunode agent does the same way."""
