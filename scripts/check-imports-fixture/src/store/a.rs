use super::b::B;
pub struct A(pub Option<B>);
