"""Research comparisons: experiments over policies, the comparison protocol, its report and statistics."""
