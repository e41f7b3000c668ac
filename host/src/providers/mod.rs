//! Model providers: the `ModelProvider` trait and the scripted provider.
