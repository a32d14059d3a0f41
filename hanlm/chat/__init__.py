"""Chat: the template, special-token audit and initialisation, the model doctor."""
