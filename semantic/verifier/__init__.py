"""The verifier: one class that scores pairs with a cross-encoder, over the network of each profile's base model."""
