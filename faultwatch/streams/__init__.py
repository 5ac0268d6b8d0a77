"""faultwatch.streams: the Faust processors (matcher and job stages) and topic tools."""
