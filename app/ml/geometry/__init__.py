"""The Lorentz (hyperboloid) model (``lorentz``) and the hyperbolic frame of an old embedding
space, with the lift of its Euclidean vectors into it (``space``)."""
