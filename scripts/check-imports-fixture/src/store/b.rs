use super::a::A;
pub struct B(pub Option<Box<A>>);
